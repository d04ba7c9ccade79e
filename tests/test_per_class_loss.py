"Panel 7's partition of a batch's losses into regular and irregular verbs."
import json
import math

import numpy as np
import pytest

from minitrain_inspect.per_class_loss import IRREGULAR_VERBS, REGULAR_VERBS, partition_batch_loss


def test_partition_batch_loss():
    "The lab's test: mixed batch against a hand computation; all-regular batch gives nan for irregular."
    losses = np.array([0.2, 1.0, 0.4, 3.0, 0.6], dtype=np.float32)
    labels = ["walk", "go", "play", "eat", "like"]
    regular, irregular = partition_batch_loss(losses, labels)
    assert regular == pytest.approx((0.2 + 0.4 + 0.6) / 3)
    assert irregular == pytest.approx(2.0)
    reg_only = partition_batch_loss(np.array([1.0, 2.0]), ["work", "study"])
    assert reg_only[0] == pytest.approx(1.5) and math.isnan(reg_only[1])


def test_sets_are_the_labs():
    assert REGULAR_VERBS == frozenset("work play walk talk listen watch study finish start look want like".split())
    assert IRREGULAR_VERBS == frozenset("be have do go come see eat write".split())


def test_sets_are_the_data_modules_own():
    "Issue 7: the verb sets live with the data; per_class_loss imports them, so both names are one object."
    from minitrain_inspect import data
    assert REGULAR_VERBS is data.REGULAR_VERBS and IRREGULAR_VERBS is data.IRREGULAR_VERBS


def test_returns_python_floats():
    r, i = partition_batch_loss(np.array([1.0, 2.0], dtype=np.float32), ["go", "walk"])
    assert type(r) is float and type(i) is float
    json.dumps([r, i])


def test_lexicon_mode_counts_every_verb_and_rejects_unknown():
    r, i = partition_batch_loss(np.array([1.0, 2.0, 4.0]), ["jump", "swim", "walk"], by="lexicon")
    assert (r, i) == (2.5, 2.0)
    assert partition_batch_loss(np.array([1.0, 2.0, 4.0]), ["jump", "swim", "walk"]) == (4.0, pytest.approx(math.nan, nan_ok=True))
    with pytest.raises(ValueError, match="unknown verb 'blorp'"):
        partition_batch_loss(np.array([1.0]), ["blorp"], by="lexicon")


@pytest.mark.parametrize("loss,labels,error,message", [
    (np.ones(3), ["go", "be"], ValueError, "3 losses but 2"),
    (np.ones((2, 2)), ["go", "be"], ValueError, "1-D"),
    (np.array([1.0, np.nan]), ["go", "be"], ValueError, "non-finite"),
    (np.array([np.inf]), ["go"], ValueError, "non-finite"),
    (np.array([1.0]), [None], TypeError, "must be strings"),
    (np.array([1.0]), "go", TypeError, "single string"),
])
def test_bad_input(loss, labels, error, message):
    with pytest.raises(error, match=message):
        partition_batch_loss(loss, labels)


def test_large_but_finite_losses_are_accepted():
    r, i = partition_batch_loss(np.array([1e308, 1e308]), ["walk", "go"])
    assert (r, i) == (1e308, 1e308)
