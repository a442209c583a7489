"""The helper module's asserts get pytest's detailed failure messages too."""

import pytest

pytest.register_assert_rewrite("gpunuma_probe")
