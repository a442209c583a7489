#!/usr/bin/env python3
"""Write docs/schemas/<document>.schema.json from gpunuma's one definition of each (common/documents.py).

    .venv/bin/python scripts/gen-schemas.py          # write them
    .venv/bin/python scripts/gen-schemas.py --check  # exit 1 when a committed file differs

tests/unit/test_documents.py runs the check.
"""

import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from gpunuma_controller.core import use_core  # noqa: E402

use_core()
from ansible.module_utils.gpunuma.common import documents  # noqa: E402

OUT = os.path.join(os.path.dirname(HERE), "docs", "schemas")


def rendered():
    """``{file name: text}`` of every schema."""
    return dict((documents.schema_file(name), json.dumps(schema, indent=1, sort_keys=True) + "\n")
                for name, schema in sorted(documents.SCHEMAS.items()))


def main(argv):
    check = "--check" in argv
    stale = []
    for name, text in rendered().items():
        path = os.path.join(OUT, name)
        current = open(path).read() if os.path.exists(path) else None
        if current != text:
            stale.append(name)
            if not check:
                os.makedirs(OUT, exist_ok=True)
                with open(path, "w") as handle:
                    handle.write(text)
    if check and stale:
        print("docs/schemas differ from common/documents.py: %s; run scripts/gen-schemas.py" % ", ".join(stale))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
