"""``python -m mayfly_contract.sim --backend B --seeds N [--seed S] [--workers K]``.

See :mod:`mayfly_contract.sim`.
"""

import sys

from mayfly_contract.sim._driver import main

sys.exit(main())
