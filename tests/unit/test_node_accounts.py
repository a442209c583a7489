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
