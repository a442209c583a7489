"""gpunuma's versioned documents: one schema each (common/documents.py), its JSON Schema file, and the readers.

Every document gpunuma's own code writes (the report fixture fleet of
tests/fixtures/report/make_artefacts.py: topologies, plans, states, audit and
validation reports, built by gpunuma's functions, plus the topology fixtures
and a recorded H200 topology) is valid under both gpunuma's loader and the
reference JSON Schema validator (``jsonschema``) reading docs/schemas/; a
document damaged at any typed field is refused naming that field.
"""

import copy
import glob
import importlib.util
import json
import os
import sys

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ansible.module_utils.gpunuma.common import documents, schemas, seal
from ansible.module_utils.gpunuma.plan import state as statelib
from conftest import FIXTURES, REPO_ROOT, examples

pytestmark = pytest.mark.unit

sys.path.insert(0, os.path.join(FIXTURES, "report"))
import make_artefacts  # noqa: E402

_spec = importlib.util.spec_from_file_location("gen_schemas", os.path.join(REPO_ROOT, "scripts", "gen-schemas.py"))
gen_schemas = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gen_schemas)


@pytest.fixture(scope="module")
def artefacts(tmp_path_factory):
    """Every document of the fixture fleet and the topology fixtures, by schema name."""
    root = str(tmp_path_factory.mktemp("fleet"))
    make_artefacts.write_fleet(root)
    found = {}
    paths = sorted(glob.glob(os.path.join(root, "**", "*.json"), recursive=True))
    paths += sorted(glob.glob(os.path.join(FIXTURES, "topologies", "*.json")))
    paths.append(os.path.join(FIXTURES, "recorded", "h200-vm", "topology.json"))
    for path in paths:
        with open(path) as handle:
            data = json.load(handle)
        if isinstance(data, dict) and data.get("schema") in documents.SCHEMAS:
            found.setdefault(data["schema"], []).append((os.path.basename(path), data))
    return found


def test_the_json_schema_files_are_what_the_one_definition_gives():
    assert gen_schemas.main(["--check"]) == 0
    assert sorted(gen_schemas.rendered()) == sorted(os.listdir(os.path.join(REPO_ROOT, "docs", "schemas")))


def test_every_document_kind_is_covered(artefacts):
    assert set(artefacts) == set(documents.SCHEMAS)
    assert set(documents.TYPES) == set(documents.SCHEMAS)
    # one definition of each name: the document types use the schema constants
    assert [documents.TYPES[name].NAME for name in documents.SCHEMAS] == list(documents.SCHEMAS)


def test_what_gpunuma_writes_is_valid_under_both_validators(artefacts):
    for name, docs in artefacts.items():
        with open(os.path.join(REPO_ROOT, "docs", "schemas", documents.schema_file(name))) as handle:
            schema = json.load(handle)
        reference = jsonschema.Draft202012Validator(schema)
        for label, data in docs:
            assert documents.problems_of(name, data) == [], label
            assert [e.message for e in reference.iter_errors(data)] == [], label
            loaded = documents.TYPES[name].load(data)
            assert loaded.to_dict() == data


def _typed_leaves(schema, value, path=()):
    """(path, schema) of every value in ``value`` whose schema states a type."""
    if "type" in schema or "enum" in schema or "const" in schema:
        yield path, schema
    if isinstance(value, dict):
        for key, sub in schema.get("properties", {}).items():
            if key in value:
                yield from _typed_leaves(sub, value[key], path + (key,))
    elif isinstance(value, list) and "items" in schema:
        for pos, item in enumerate(value[:3]):
            yield from _typed_leaves(schema["items"], item, path + (pos,))


def _shown(name, path):
    out = name.split("/")[0].split(".")[-1]
    for part in path:
        out += "[%d]" % part if isinstance(part, int) else ".%s" % part
    return out


def _set(data, path, value):
    target = data
    for part in path[:-1]:
        target = target[part]
    target[path[-1]] = value


def _wrong(schema):
    """A value of no type the schema allows."""
    kinds = schema.get("type")
    kinds = [kinds] if isinstance(kinds, str) else (kinds or [])
    for candidate in ({"x": 1}, ["x"], "x", 3, True):
        if not any(documents._TYPES[k](candidate) for k in kinds) and candidate not in schema.get("enum", ()) \
                and candidate != schema.get("const"):
            return candidate
    return None


@settings(max_examples=examples(200), deadline=None)
@given(data=st.data())
def test_a_document_damaged_at_any_typed_field_is_refused_naming_it(artefacts, data):
    name = data.draw(st.sampled_from(sorted(artefacts)))
    label, document = data.draw(st.sampled_from(artefacts[name]))
    leaves = [(p, s) for p, s in _typed_leaves(documents.SCHEMAS[name], document) if p]
    path, schema = data.draw(st.sampled_from(leaves))
    wrong = _wrong(schema)
    if wrong is None:
        return
    damaged = copy.deepcopy(document)
    _set(damaged, path, wrong)
    with pytest.raises(documents.DocumentError) as caught:
        documents.TYPES[name].load(damaged)
    assert any(p.startswith(_shown(name, path) + ":") for p in caught.value.problems), (label, path, caught.value)


@pytest.mark.parametrize("name", sorted(documents.SCHEMAS))
def test_a_document_without_a_required_key_says_it_is_missing(artefacts, name):
    _, document = artefacts[name][0]
    for key in documents.SCHEMAS[name]["required"]:
        damaged = dict(document)
        del damaged[key]
        problems = documents.problems_of(name, damaged)
        assert "%s.%s: missing; the document needs it" % (_shown(name, ()), key) in problems


def test_state_files_are_read_through_the_state_schema():
    with pytest.raises(statelib.StateCorrupt) as caught:
        statelib.parse_state(json.dumps(seal.seal({"schema": "gpunuma.state/v1", "history": [{"time": 3, "to": "strict"}]})),
                             "/s.json")
    assert "/s.json: state.history[0].time: 3 is not a string" in str(caught.value)
    # an older gpunuma's lean file (no pinned, no history) still reads
    lean = json.dumps(seal.seal({"schema": "gpunuma.state/v1", "profile": "strict"}))
    assert statelib.parse_state(lean, "/s.json")["profile"] == "strict"


def test_a_plan_read_from_text_names_the_file_and_fields(tmp_path):
    plan, why = documents.load_text(documents.Plan, '{"schema": "gpunuma.plan/v1", "instances": 5}', "n:/plan.json")
    assert plan is None
    assert why.startswith("n:/plan.json: not a gpunuma.plan/v1 document: ")
    assert "plan.profile: missing" in why and "plan.instances: 5 is not a list" in why
    assert documents.load_text(documents.Plan, "{nope", "n:/plan.json")[1].startswith("n:/plan.json: not valid JSON")
    # the starting profile of a node an older gpunuma provisioned stays readable from its lean plan.json
    path = tmp_path / "plan.json"
    path.write_text('{"profile": "preferred-cpu-only"}')
    assert statelib.applied_profile(str(path)) == "preferred"
    path.write_text('{"schema": "gpunuma.plan/v1", "profile": 3, "instances": []}')
    assert statelib.applied_profile(str(path)) is None


def test_schema_names_come_from_the_one_table():
    assert set(documents.SCHEMAS) <= set(schemas.DOCUMENTS)
