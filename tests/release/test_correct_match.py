"""The empirical correct-match table of 001 sec. 7.1, on hand-made releases."""

from __future__ import annotations

import numpy as np
import pytest

from veil.release import TableError, correct_match_from_cells, correct_match_table, total_variation_distance


def test_hand_computed_entries():
    # Original cells: A(1) B(1) C(2: u3, u4) D(3). Released: A's unit moves to B; B's stays;
    # C's two units stay; D's three stay.
    original = np.array([0, 1, 2, 2, 3, 3, 3])
    released = np.array([1, 1, 2, 2, 3, 3, 3])
    cm = correct_match_from_cells(original, released)
    # Unit of A: changed, tau* = S_A = 0 -> CM 0, no match. Unit of B: kept, tau* = 2 -> 1/2.
    # Units of C: kept, tau* = 2 -> 1/2 each.
    assert np.isnan(cm.probability[0, 0]) and cm.units[0, 0] == 0  # no tau = 1 unit has tau* = 1
    assert cm.probability[1, 0] == pytest.approx(0.5) and cm.units[1, 0] == 1  # tau = 1, tau* = 2 (B)
    assert cm.probability[1, 1] == pytest.approx(0.5) and cm.units[1, 1] == 2  # tau = 2, tau* = 2 (C)
    assert cm.probability[2, 0] == pytest.approx(0.25)  # P(CM | tau = 1): (0 + 1/2) / 2
    assert cm.probability[1, 2] == pytest.approx(0.5)  # P(CM | tau* = 2) over tau <= 2: 3 units, all 1/2
    assert cm.probability[2, 2] == pytest.approx((0 + 0.5 + 0.5 + 0.5) / 4)
    assert cm.changed.tolist() == [0.5, 0.0] and cm.no_match.tolist() == [0.5, 0.0]
    assert cm.largest() == pytest.approx(0.5)
    text = cm.format()
    assert "tau*=2" in text and "0.5000" in text and "-" in text


def test_the_papers_arithmetic_for_tau_1_tau_star_2():
    # Sec. 7.1: 2,570 units with tau = 1, tau* = 2, of which 1,008 kept their record:
    # (1008 * 0.5 + 1562 * 0) / 2570 = 0.1961. Kept units get one newcomer; the others leave for
    # a sink cell and get two newcomers; newcomers come from one large source cell.
    units, kept = 2570, 1008
    own = np.arange(units)
    released_own = np.where(own < kept, own, 99_999)
    targets = np.concatenate([own[:kept], np.repeat(own[kept:], 2)])
    original = np.concatenate([own, np.full(targets.size, 50_000)])
    released = np.concatenate([released_own, targets])
    cm = correct_match_from_cells(original, released)
    assert cm.units[1, 0] == units and round(cm.probability[1, 0], 4) == 0.1961
    assert cm.changed[0] == pytest.approx((units - kept) / units)


def test_table_form_matches_cell_form_and_tvd():
    original = {"a": np.array(["x", "x", "y", "z", "z"]), "b": np.array(["1", "2", "1", "1", "1"])}
    released = {"a": np.array(["x", "y", "y", "z", "z"]), "b": np.array(["1", "2", "1", "1", "1"])}
    cm = correct_match_table(original, released, ["a", "b"])
    # Cells (x,1) (x,2) (y,1) (z,1)x2: unit 2 moved (x,2) -> (y,2), a new cell.
    assert cm.probability[2, 0] == pytest.approx(2 / 3)  # three unique units: 1, 0, 1
    assert total_variation_distance(original, released, ["a"]) == pytest.approx(0.2)
    assert total_variation_distance(original, released, ["b"]) == 0.0
    with pytest.raises(TableError, match="released table has 4 records, the original 5"):
        correct_match_table(original, {k: v[:4] for k, v in released.items()}, ["a"])
    with pytest.raises(TableError, match="column 'c' is not in the table"):
        correct_match_table(original, released, ["c"])
