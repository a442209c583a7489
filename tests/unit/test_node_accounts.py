"""The account instances run as, created by gpunuma_apply (module_utils/gpunuma/node/accounts.py)."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ansible.module_utils.gpunuma.node import accounts

pytestmark = pytest.mark.unit

SPEC = {"name": "gpunuma", "comment": "gpunuma inference instances", "home": "/var/lib/gpunuma-instances",
        "shell": "/usr/sbin/nologin", "groups": ["video", "render"]}


class Runner:
    def __init__(self, rc=0, err=""):
        self.calls, self.rc, self.err = [], rc, err

    def __call__(self, argv):
        self.calls.append(argv)
        return self.rc, "", self.err


def test_a_missing_account_is_created_by_one_useradd():
    runner = Runner()
    done = accounts.ensure(runner, SPEC, False, exists=lambda name: False)
    assert done == {"name": "gpunuma", "created": True, "changed": True}
    assert runner.calls == [["useradd", "--system", "--create-home", "--comment", "gpunuma inference instances",
                             "--home-dir", "/var/lib/gpunuma-instances", "--shell", "/usr/sbin/nologin",
                             "--groups", "video,render", "--", "gpunuma"]]


def test_an_existing_account_is_left_as_it_is():
    runner = Runner()
    assert accounts.ensure(runner, SPEC, False, exists=lambda name: True) == {
        "name": "gpunuma", "created": False, "changed": False}
    assert runner.calls == []


def test_check_mode_says_what_it_would_create_and_runs_nothing():
    runner = Runner()
    assert accounts.ensure(runner, SPEC, True, exists=lambda name: False)["created"] is True
    assert runner.calls == []


def test_a_failed_useradd_names_the_account_and_its_message():
    with pytest.raises(accounts.AccountError, match=r"creating the account gpunuma failed \(useradd rc 6\): "
                                                    r"useradd: group 'render' does not exist"):
        accounts.ensure(Runner(6, "useradd: group 'render' does not exist\n"), SPEC, False, exists=lambda n: False)


@pytest.mark.parametrize("field, value, needle", [
    ("name", "Gpu numa", "account.name: 'Gpu numa' is not allowed"),
    ("name", "-rf", "account.name: '-rf' is not allowed"),
    ("home", "var/lib/x", "account.home: 'var/lib/x' is not allowed; allowed: an absolute path"),
    ("shell", "nologin", "account.shell: 'nologin' is not allowed"),
    ("groups", ["video", "a b"], "account.groups: 'a b' is not allowed"),
    ("comment", "a:b", "account.comment: 'a:b' is not allowed"),
    ("comment", "line\nnext", "account.comment: 'line\\nnext' holds a control character"),
    ("comment", "tab\there", "account.comment: 'tab\\there' holds a control character"),
    ("home", "/var/lib/x\n", "account.home: '/var/lib/x\\n' holds a control character"),
    ("shell", "/bin/sh\x00", "account.shell: '/bin/sh\\x00' holds a control character"),
])
def test_bad_input_is_refused_before_anything_runs(field, value, needle):
    runner = Runner()
    with pytest.raises(accounts.AccountError) as err:
        accounts.ensure(runner, dict(SPEC, **{field: value}), False, exists=lambda name: False)
    assert needle in str(err.value)
    assert runner.calls == []


@given(st.text(max_size=40))
def test_useradd_never_gets_a_name_it_could_read_as_an_option(name):
    spec = dict(SPEC, name=name)
    if accounts.account_problem(spec) is None:
        argv = accounts.useradd_argv(spec)
        assert argv[-2:] == ["--", name] and not name.startswith("-") and name == name.strip()


# The accounts a plan's instances run as against the accounts a node has (missing_accounts,
# missing_account_problems: the planning step's check and the given-plan check of the numa_binding role).
NAMES = st.sampled_from(["gpunuma", "root", "svc-llm", "svc-emb", None])


def _plan(users):
    return {"instances": [{"name": "i%d" % n, "user": user} for n, user in enumerate(users)]}


@given(users=st.lists(NAMES, max_size=6), present=st.sets(st.sampled_from(["gpunuma", "root", "svc-llm", "svc-emb"])))
def test_missing_accounts_are_the_named_accounts_the_node_lacks_in_plan_order(users, present):
    node = {"users": {name: {"exists": name in present} for name in ("gpunuma", "root", "svc-llm", "svc-emb")}}
    missing = accounts.missing_accounts(_plan(users), node)
    assert missing == list(dict.fromkeys(u for u in users if u is not None and u not in present))


@given(users=st.lists(NAMES, max_size=6), present=st.sets(st.sampled_from(["gpunuma", "root", "svc-llm", "svc-emb"])),
       create=st.booleans(), start=st.booleans())
def test_an_account_problem_is_exactly_a_missing_account_this_run_does_not_create(users, present, create, start):
    node = {"users": {name: {"exists": True} for name in present}}
    problems = accounts.missing_account_problems(_plan(users), node, "gpu-a01", start, create)
    blocking = [u for u in users if u is not None and u not in present and not (create and u == "gpunuma")]
    assert bool(problems) == (start and bool(blocking))
    if problems:
        (line,) = problems
        assert line.startswith("gpu-a01: no account ") and all(u in line for u in blocking)
        # Every instance that runs as a missing account is named.
        named = [i["name"] for i in _plan(users)["instances"] if i["user"] in accounts.missing_accounts(_plan(users), node)]
        assert "instances %s run as it" % ", ".join(named) in line


def test_the_fix_names_the_variable_that_creates_the_dedicated_account():
    plan = _plan(["gpunuma"])
    (line,) = accounts.missing_account_problems(plan, {"users": {}}, "gpu-a01", True, False)
    assert "numa_binding_create_user: true" in line
    assert accounts.missing_account_problems(plan, {"users": {}}, "gpu-a01", True, True) == []
    (other,) = accounts.missing_account_problems(_plan(["svc-llm"]), {"users": {}}, "gpu-a01", True, True)
    assert "leave `user` out to run as the gpunuma account" in other


def test_accounts_not_read_are_no_problem():
    """A node read without the accounts section (a planning step whose read did not ask) checks nothing."""
    assert accounts.missing_account_problems(_plan(["svc-llm"]), None, "gpu-a01", True, False) == []


@given(users=st.lists(NAMES, max_size=6), present=st.sets(st.sampled_from(["gpunuma", "root", "svc-llm", "svc-emb"])),
       create=st.booleans(), start=st.booleans(),
       groups=st.lists(st.sampled_from(["video", "render", "kfd"]), unique=True, max_size=3),
       node_groups=st.sets(st.sampled_from(["video", "render", "kfd"])))
def test_the_dedicated_account_is_created_exactly_when_an_instance_runs_as_it_and_the_node_lacks_it(
        users, present, create, start, groups, node_groups):
    node = {"users": {name: {"exists": True} for name in present},
            "groups": {g: g in node_groups for g in ("video", "render", "kfd")}}
    spec = accounts.account_to_create(_plan(users), node, start, create, groups)
    wanted = start and create and "gpunuma" in users and "gpunuma" not in present
    assert (spec is not None) == wanted
    if spec:
        # The device groups asked for that the node has, in the order asked; useradd would accept the spec.
        assert spec["name"] == "gpunuma" and spec["groups"] == [g for g in groups if g in node_groups]
        assert accounts.account_problem(spec) is None


@given(st.lists(st.one_of(st.fixed_dictionaries({"name": st.just("i")}, optional={"user": NAMES}),
                          st.integers(), st.text(max_size=3)), max_size=5))
def test_the_node_read_asks_for_the_dedicated_account_and_every_instance_account_once(instances):
    names = accounts.users_to_read(instances)
    named = [i.get("user") for i in instances if isinstance(i, dict) and isinstance(i.get("user"), str)]
    assert names[0] == "gpunuma" and len(names) == len(set(names)) and set(names) == {"gpunuma", *named}
    assert accounts.users_to_read("not a list") == ["gpunuma"]
