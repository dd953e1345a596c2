"""Without the oracle, the original scheme waits for a spare vector unless told otherwise.

``--no-verify`` leaves the redundancy check as the only content check of an exact round of the
original scheme, and it needs one vector beyond a decodable set. The PS options of such a run
get :data:`NO_VERIFY_SPARE_WAIT` unless ``--spare-wait`` is given (0 turns it off); with the
oracle, or for a scheme whose redundancy check does not apply (partial), nothing changes.
"""

from __future__ import annotations

import pytest

from aiogc.config import RunConfig
from aiogc.harness.evictions import NO_VERIFY_SPARE_WAIT, locate_ps_options

ORIGINAL = RunConfig(scheme="original", workers=8, delta=3, rounds=5, seed=1)


@pytest.mark.parametrize(("config", "verify", "given", "expected"), [
    (ORIGINAL, False, None, NO_VERIFY_SPARE_WAIT),
    (ORIGINAL, False, 0.0, 0.0),  # told otherwise
    (ORIGINAL, False, 0.25, 0.25),
    (ORIGINAL, True, None, 0.0),  # the oracle checks every round
    (RunConfig(scheme="partial", workers=8, delta=3, rounds=5), False, None, 0.0),
    (RunConfig(scheme="original", workers=8, delta=3, n_parts=2, rounds=5), False, None,
     NO_VERIFY_SPARE_WAIT),  # delta - ell = 1: one straggler tolerated, one spare
])
def test_the_spare_wait_of_a_run(config: RunConfig, verify: bool, given: float | None,
                                 expected: float) -> None:
    opts = locate_ps_options(config, None, given, verify=verify)
    assert opts.spare_wait == expected
    assert opts.spares == 1


def test_with_locate_the_locate_default_applies() -> None:
    cfg = RunConfig(scheme="original", workers=8, delta=3, rounds=5)
    opts = locate_ps_options(cfg, 3, None, verify=False)
    assert (opts.spare_wait, opts.spares) == (1.0, 2)
