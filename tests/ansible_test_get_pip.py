"""ansible-test's pip bootstrap for a machine that reaches PyPI but not ci-files.testing.ansible.com.

ansible-test creates a virtual environment per sanity test and puts pip in it by running the
get-pip.py it downloads from ci-files.testing.ansible.com (cached as
~/.ansible/test/cache/get_pip_<version>.py). This stands in for it: the pip wheel that Python's own
ensurepip bundles runs `pip install` with ansible-test's arguments (the pinned pip itself comes from
the package index, as with get-pip.py), less get-pip.py's own options. tests/collection/test_built_collection.py
copies it to that cache path when nothing is there.
"""

import ensurepip
import sys
from pathlib import Path

sys.path.insert(0, str(next((Path(ensurepip.__file__).parent / "_bundled").glob("pip-*.whl"))))
from pip._internal.cli.main import main

# get-pip.py's own options: without them it would also install setuptools and wheel.
GET_PIP_OPTIONS = ("--no-setuptools", "--no-wheel")

if __name__ == "__main__":
    sys.exit(main(["install", *(arg for arg in sys.argv[1:] if arg not in GET_PIP_OPTIONS)]))
