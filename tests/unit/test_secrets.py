"""Secret environment values (module_utils/gpunuma/common/secrets.py): out of the plan, into a 0600 file."""

import json
import os
import subprocess

import pytest

from ansible.module_utils.gpunuma.common import secrets
from ansible.module_utils.gpunuma.node.apply.files import normalise_files
from ansible.module_utils.gpunuma.plan.model import PlanError
from ansible.module_utils.gpunuma.plan.planner import build_plan
from test_node_apply import FakeModule, FakeSystemd, NodeFiles, Apply
from test_plan import profile, topology

pytestmark = pytest.mark.unit

TOKEN = "hf_Zq9 \"quoted\" $HOME `cmd` \\back"


def _instances():
    return [
        {"name": "llm0", "gpus": [0], "command": ["/opt/vllm/bin/vllm", "serve"],
         "environment": {"HF_TOKEN": TOKEN, "db_password": "pw1", "MODEL": "llama", "S3_BUCKET": "b1",
                         "AWS_ACCESS_KEY_ID": "AKIA1"},
         "secret_environment": ["S3_BUCKET"]},
        {"name": "tok", "numa_node": 0, "command": ["/opt/tok"], "environment": {"PORT": "8081"}},
    ]


@pytest.mark.parametrize("name, secret", [
    ("HF_TOKEN", True), ("hf_token", True), ("DB_PASSWORD", True), ("MYSQL_PASSWD", True), ("API_SECRET", True),
    ("OPENAI_API_KEY", True), ("GOOGLE_APPLICATION_CREDENTIALS", True),
    ("MODEL", False), ("CUDA_VISIBLE_DEVICES", False), ("PORT", False), ("NCCL_IB_HCA", False),
])
def test_default_patterns(name, secret):
    assert secrets.is_secret(name) is secret


def test_marked_names_and_own_patterns():
    assert secrets.is_secret("S3_BUCKET", secrets.DEFAULT_PATTERNS, ["S3_BUCKET"])
    assert secrets.is_secret("LICENSE_SERVER", ["LICENSE_*"]) and not secrets.is_secret("HF_TOKEN", ["LICENSE_*"])
    assert secrets.pattern_problems(["*TOKEN*", "A?B"]) == []
    assert len(secrets.pattern_problems(["*TOKEN*", "", 5, "x\ny"])) == 3
    assert secrets.pattern_problems("*TOKEN*")


def test_redaction_replaces_values_of_secret_names_only_and_leaves_the_input_alone():
    instances = _instances()
    before = json.dumps(instances, sort_keys=True)
    out = secrets.redact_instances(instances)
    assert json.dumps(instances, sort_keys=True) == before
    env = out[0]["environment"]
    assert env == {"HF_TOKEN": secrets.REDACTED, "db_password": secrets.REDACTED, "MODEL": "llama",
                   "S3_BUCKET": secrets.REDACTED, "AWS_ACCESS_KEY_ID": secrets.REDACTED}
    assert out[1]["environment"] == {"PORT": "8081"}
    assert secrets.redact_instances("junk") == "junk"


def test_the_plan_keeps_names_never_values():
    plan = build_plan(topology("hgx-h200-8gpu-2socket-ht"), profile("strict"),
                      secrets.redact_instances(_instances()), housekeeping_cores_per_node=1)
    llm0, tok = plan["instances"]
    assert llm0["secret_environment"] == ["AWS_ACCESS_KEY_ID", "HF_TOKEN", "S3_BUCKET", "db_password"]
    assert set(llm0["environment"]) == {"MODEL", "CUDA_VISIBLE_DEVICES"}
    assert tok["secret_environment"] == [] and tok["environment"] == {"PORT": "8081"}
    text = json.dumps(plan)
    for value in (TOKEN, "pw1", "b1", "AKIA1", secrets.REDACTED):
        assert value not in text
    # Given the values (no redaction), the plan still leaves them out.
    text = json.dumps(build_plan(topology("hgx-h200-8gpu-2socket-ht"), profile("strict"), _instances(),
                                 housekeeping_cores_per_node=1))
    for value in (TOKEN, "pw1", "b1", "AKIA1"):
        assert value not in text


def test_secret_environment_must_name_variables_of_the_instance():
    instances = _instances()
    instances[0]["secret_environment"] = ["NOT_THERE"]
    instances[1]["secret_environment"] = "PORT"
    with pytest.raises(PlanError) as err:
        build_plan(topology("hgx-h200-8gpu-2socket-ht"), profile("strict"), instances, housekeeping_cores_per_node=1)
    text = str(err.value)
    assert "gpunuma_instances[0].secret_environment[0]: names no variable of this instance's environment" in text
    assert "gpunuma_instances[1].secret_environment: is a str, not a list of variable names" in text
    # The entries themselves are never quoted: a value written there by mistake would be printed.
    assert "NOT_THERE" not in text and "'PORT'" not in text


def test_bad_patterns_are_refused_naming_the_field():
    with pytest.raises(PlanError, match=r"secret_patterns\[0\]"):
        build_plan(topology("hgx-h200-8gpu-2socket-ht"), profile("strict"), [], secret_patterns=[""])


def test_env_file_round_trips_through_systemds_quoting(tmp_path):
    """The file's quoting read back the way systemd reads EnvironmentFile= (double quotes, \\ escapes "\\`$),
    checked against a POSIX shell, whose double-quote rules these are."""
    text = secrets.env_file_text("# managed", "llm0", ["HF_TOKEN", "db_password"], _instances())
    assert text.splitlines()[0] == "# managed"
    path = tmp_path / "llm0.env"
    path.write_text(text)
    shell = "set -a; . %s; printf '%%s\\0%%s' \"$HF_TOKEN\" \"$db_password\"" % path
    token, password = subprocess.run(["sh", "-c", shell], capture_output=True, text=True, check=True,
                                     env={"PATH": os.environ["PATH"]}).stdout.split("\0")
    assert token == TOKEN and password == "pw1"


@pytest.mark.parametrize("value, needle", [("a\nb", "line break"), ("a\rb", "line break"), ("a\0b", "line break"),
                                           (5, "not text")])
def test_env_file_refuses_what_one_line_cannot_hold(value, needle):
    instances = [{"name": "x", "environment": {"API_TOKEN": value}}]
    with pytest.raises(secrets.SecretError) as err:
        secrets.env_file_text("", "x", ["API_TOKEN"], instances)
    assert needle in str(err.value) and "'x'.environment.API_TOKEN" in str(err.value)
    assert "a\nb" not in str(err.value)


def test_env_files_and_stale_ones():
    plan = {"instances": [{"name": "llm0", "unit": "gpunuma-llm0.service", "secret_environment": ["HF_TOKEN"]},
                          {"name": "tok", "unit": "gpunuma-tok.service", "secret_environment": []}]}
    [entry] = secrets.env_files(plan, _instances(), "/etc/gpunuma/env")
    assert entry["path"] == "/etc/gpunuma/env/llm0.env" and entry["mode"] == "0600"
    assert entry["unit"] == "gpunuma-llm0.service"
    assert entry["content"].splitlines()[-1] == 'HF_TOKEN="hf_Zq9 \\"quoted\\" \\$HOME \\`cmd\\` \\\\back"'
    applied = {"instances": [{"name": "llm0", "secret_environment": ["HF_TOKEN"]},
                             {"name": "old", "secret_environment": ["X_TOKEN"]},
                             {"name": "tok", "secret_environment": ["Y_KEY"]}]}
    assert secrets.stale_env_files(applied, plan, "/etc/gpunuma/env") == ["/etc/gpunuma/env/old.env",
                                                                           "/etc/gpunuma/env/tok.env"]
    assert secrets.stale_env_files(None, plan, "/e") == [] and secrets.stale_env_files({"instances": 5}, plan, "/e") == []


def test_apply_writes_secret_files_0600_and_redacts_their_diff(tmp_path):
    path = str(tmp_path / "env" / "llm0.env")
    fake = FakeSystemd()
    apply = Apply(NodeFiles(FakeModule().run_command), fake, fake.sleep)
    files = normalise_files([{"path": path, "content": "HF_TOKEN=\"first-secret\"\n", "mode": "0600",
                              "dir_mode": "0700", "secret": True}])
    result = apply.run(files)
    assert oct(os.stat(path).st_mode & 0o777) == "0o600"
    assert oct(os.stat(os.path.dirname(path)).st_mode & 0o777) == "0o700"
    assert "first-secret" not in json.dumps(result)
    [diff] = result["diff"]
    assert diff["after"].startswith(secrets.REDACTED) and diff["before"] == ""

    apply = Apply(NodeFiles(FakeModule().run_command), fake, fake.sleep)
    files = normalise_files([{"path": path, "content": "HF_TOKEN=\"second-secret\"\n", "mode": "0600", "secret": True}])
    result = apply.run(files, backups_keep=5)
    text = json.dumps(result)
    assert "first-secret" not in text and "second-secret" not in text
    [backup] = [os.path.join(os.path.dirname(path), f) for f in os.listdir(os.path.dirname(path)) if f.endswith("~")]
    assert oct(os.stat(backup).st_mode & 0o777) == "0o600"

    # Gone: the file and every backup of it, the diff redacted.
    apply = Apply(NodeFiles(FakeModule().run_command), fake, fake.sleep)
    result = apply.run([], secret_absent=[path])
    assert result["removed"] == [path] and sorted(result["pruned_backups"]) == [backup]
    assert os.listdir(os.path.dirname(path)) == []
    assert "first-secret" not in json.dumps(result) and "second-secret" not in json.dumps(result)


def test_problems_name_the_entry_and_variable_never_the_value():
    instances = [{"name": "x", "environment": {"API_TOKEN": "line1-hunter2\nline2", "PLAIN": "a\nb"}},
                 {"name": "y", "environment": {"S3_BUCKET": "b\r"}, "secret_environment": ["S3_BUCKET"]}, "junk"]
    problems = secrets.value_problems(instances, secrets.DEFAULT_PATTERNS)
    assert problems == [
        "gpunuma_instances[0].environment.API_TOKEN: the secret holds a line break or NUL; allowed: one line of text "
        "(the value is not shown)",
        "gpunuma_instances[1].environment.S3_BUCKET: the secret holds a line break or NUL; allowed: one line of text "
        "(the value is not shown)"]
    assert secrets.value_problems([{"name": "x", "environment": {"API_TOKEN": "ok"}}], secrets.DEFAULT_PATTERNS) == []


# -- a secret in malformed input is never quoted ---------------------------------------------------------------------

SECRET = "hunter2-Zq9Secret"


def _spec_options():
    import yaml
    from conftest import REPO_ROOT
    with open(os.path.join(REPO_ROOT, "roles", "numa_binding", "meta", "argument_specs.yml")) as handle:
        return yaml.safe_load(handle)["argument_specs"]["main"]["options"]


def _messages(instances):
    """Every message the input check and the planner give for ``instances``."""
    from ansible.module_utils.gpunuma.run import role_inputs
    out = list(role_inputs.input_problems(_spec_options(), {"numa_binding_instances": instances}))
    try:
        build_plan(topology("h200-1gpu-vm"), profile("strict"), instances)
    except PlanError as exc:
        out.append(str(exc))
    except Exception as exc:  # noqa: BLE001  (a crash is a finding of its own; its text must not carry it either)
        out.append(repr(exc))
    return out


def _placements():
    """Where a user may put a secret by mistake, each in an instance list that is malformed around it."""
    good = {"name": "w", "numa_node": 0, "command": ["/bin/sleep", "infinity"]}
    return {
        "instances as a mapping": {"w": dict(good, environment={"HF_TOKEN": SECRET})},
        "environment as a list": [dict(good, environment=["HF_TOKEN=" + SECRET])],
        "environment value a mapping": [dict(good, environment={"HF_TOKEN": {"value": SECRET}})],
        "environment value a list": [dict(good, environment={"API_KEY": [SECRET]})],
        "secret_environment with values": [dict(good, secret_environment={"X": SECRET})],
        "secret_environment naming a value": [dict(good, environment={"A": "1"}, secret_environment=["HF_TOKEN=" + SECRET])],
        "a misspelt key": [dict(good, enviroment={"HF_TOKEN": SECRET})],
        "an entry that is text": [good, "HF_TOKEN=" + SECRET],
        "an entry that is a list": [good, [SECRET]],
        "a marked name's value a number": [dict(good, environment={"MODEL": 1, "DB": SECRET + "\n"},
                                                secret_environment=["DB"])],
    }


@pytest.mark.parametrize("where", sorted(_placements()))
def test_a_secret_in_malformed_instances_is_never_in_a_message(where):
    instances = _placements()[where]
    messages = _messages(instances)
    assert messages, "malformed input passed: %r" % where
    assert not any(SECRET in m for m in messages), messages


def test_redact_value_hides_secret_looking_values_at_any_depth():
    value = {"a": [{"environment": {"HF_TOKEN": SECRET, "MODEL": "m", "S3": SECRET}, "secret_environment": ["S3"]}],
             "b": ["PASSWORD=" + SECRET, "PORT=8000"], "secret_environment": {"X": SECRET}}
    out = secrets.redact_value(value)
    assert SECRET not in json.dumps(out)
    assert out["a"][0]["environment"]["MODEL"] == "m" and out["b"][1] == "PORT=8000"
    assert out["b"][0] == "PASSWORD=" + secrets.REDACTED


@pytest.mark.parametrize("command, flags", [
    (["/usr/bin/vllm", "serve", "m", "--api-key", "sk-live-123"], ["--api-key"]),
    (["/usr/bin/vllm", "serve", "m", "--api-key=sk-live-123", "--hf-token", "hf_abc"], ["--api-key", "--hf-token"]),
    # A path names a key file; an option without a value, or followed by another option, holds nothing.
    (["/usr/bin/vllm", "serve", "m", "--ssl-keyfile", "/etc/ssl/key.pem"], []),
    (["/usr/bin/x", "--api-key"], []),
    (["/usr/bin/x", "--api-key", "--port", "8000"], []),
    (["/usr/bin/x", "--kv-cache-dtype", "fp8", "--port", "8000"], []),
    (None, []),
])
def test_command_options_that_carry_a_secret_are_found(command, flags):
    assert secrets.command_secret_flags(command) == flags


def test_a_secret_on_the_command_line_is_warned_about_without_its_value():
    instance = {"name": "api", "gpus": [0], "command": ["/usr/bin/vllm", "serve", "m", "--api-key", "sk-live-123"]}
    plan = build_plan(topology("hgx-h200-8gpu-2socket-ht"), profile("strict"), [instance])
    said = [w for w in plan["warnings"] if "--api-key" in w]
    assert len(said) == 1 and "VLLM_API_KEY" in said[0] and "0600" in said[0], plan["warnings"]
    assert "sk-live-123" not in json.dumps(plan["warnings"])
    # Patterns the user narrowed: no longer a secret, no warning.
    quiet = build_plan(topology("hgx-h200-8gpu-2socket-ht"), profile("strict"), [instance], secret_patterns=["*TOKEN*"])
    assert not [w for w in quiet["warnings"] if "--api-key" in w]


def test_a_value_longer_than_systemd_reads_a_line_is_refused_never_shown():
    """systemd reads a unit or environment file a line at a time, at most LONG_LINE_MAX (1 MiB): a longer line is
    dropped and the engine starts without it. Refused before any host changes, naming the variable."""
    long_secret = "s" * secrets.SYSTEMD_LINE_MAX
    instances = [{"name": "api", "gpus": [0], "command": ["/usr/bin/x"], "environment": {"HF_TOKEN": long_secret}}]
    (problem,) = secrets.value_problems(instances, secrets.DEFAULT_PATTERNS)
    assert problem.startswith("gpunuma_instances[0].environment.HF_TOKEN: the secret is %d characters"
                              % len(long_secret)) and long_secret[:20] not in problem
    # Just under the limit, quoted: written whole.
    fits = "s" * (secrets.SYSTEMD_LINE_MAX - len('HF_TOKEN=""') - 2)
    assert secrets.value_problems([dict(instances[0], environment={"HF_TOKEN": fits})], secrets.DEFAULT_PATTERNS) == []
    # A plain value goes into the unit's Environment= line: the planner refuses it the same way.
    plain = dict(instances[0], environment={"MODEL_CONFIG": "c" * secrets.SYSTEMD_LINE_MAX})
    with pytest.raises(PlanError) as caught:
        build_plan(topology("hgx-h200-8gpu-2socket-ht"), profile("strict"), [plain])
    assert "gpunuma_instances[0].environment.MODEL_CONFIG: %d characters, longer than systemd reads a line" % (
        secrets.SYSTEMD_LINE_MAX) in str(caught.value)
