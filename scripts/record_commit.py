"""Records this checkout's commit for the evidence scripts run from a copy of it (GPU machine).

    python scripts/record_commit.py

writes ``.device-commit`` (ignored by git): HEAD, whether tracked files differ from it, and a
digest of the tree's Python files. Carry it in the device call (``carry: [".device-commit"]``);
the evidence's provenance then names that commit where the copy's Python files are the ones
recorded, and ignores the record otherwise (``gdn_evidence/harness/provenance.py``,
``recorded_commit``). ``GDN_INVARIANT_GIT_COMMIT`` in the environment still wins.
"""

import sys

import checkout  # noqa: F401 - this checkout first on sys.path

from gdn_evidence.harness.provenance import COMMIT_RECORD, record_commit


def main() -> int:
    record = record_commit()
    state = "dirty" if record["git_dirty"] else "clean"
    print(f"{COMMIT_RECORD}: {record['git_commit']} ({state})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
