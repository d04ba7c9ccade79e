"Lexicon, spelling rules, encoding, split and the batch iterator."
import re

import numpy as np
import pytest

from minitrain_inspect import data as data_module
from minitrain_inspect.data import (MAX_LEMMA_LEN, MAX_PAST_LEN, N_SYMBOLS, decode_word, encode_word, iterate_batches,
                                    load_lexicon, make_dataset, one_hot, regular_past_tense)

LAB = "be have do go come see eat write work play walk talk listen watch study finish start look want like".split()


def test_lexicon_size_and_required_verbs():
    lex = load_lexicon()
    assert len(lex.irregular) >= 150 and len(lex.regular) >= 600
    for lemma in LAB:
        assert lemma in lex
    assert [lex.is_regular(v) for v in "be have do go come see eat write".split()] == [False] * 8
    assert all(lex.is_regular(v) for v in LAB[8:])


@pytest.mark.parametrize("lemma,past", [
    ("like", "liked"), ("agree", "agreed"), ("study", "studied"), ("carry", "carried"), ("play", "played"),
    ("stop", "stopped"), ("plan", "planned"), ("fix", "fixed"), ("snow", "snowed"), ("rain", "rained"),
    ("visit", "visited"), ("panic", "panicked"), ("walk", "walked"), ("quiz", "quizzed"),
])
def test_spelling_rules(lemma, past):
    assert regular_past_tense(lemma) == past


def test_rules_agree_with_lexicon_except_stressed_doubling():
    lex = load_lexicon()
    for v in lex.regular:
        rule = regular_past_tense(v.lemma)
        assert rule == v.past or v.past == v.lemma + v.lemma[-1] + "ed", (v, rule)


def test_encoding_round_trip_and_errors():
    for word in ("go", "went", "internalized"):
        assert decode_word(encode_word(word, 14)) == word
    with pytest.raises(ValueError, match="outside a-z"):
        encode_word("Go", 12)
    with pytest.raises(ValueError, match="at most 12"):
        encode_word("a" * 13, MAX_LEMMA_LEN)


def test_split_is_stratified_disjoint_and_seeded():
    data = make_dataset(0.2, seed=0, keep_in_train=LAB)
    assert not set(data.train.lemmas) & set(data.val.lemmas)
    assert set(LAB) <= set(data.train.lemmas)
    assert abs(data.train.regular.mean() - data.val.regular.mean()) < 0.01
    again = make_dataset(0.2, seed=0, keep_in_train=LAB)
    assert (again.val.lemmas == data.val.lemmas).all()


def test_batches_are_deterministic_and_carry_labels():
    data = make_dataset(0.2, seed=0)
    a = list(iterate_batches(data.train, 32, 10, seed=5))
    b = list(iterate_batches(data.train, 32, 10, seed=5))
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x.inputs, y.inputs)
        assert list(x.lemmas) == list(y.lemmas)
    lex = load_lexicon()
    for lemma, target in zip(a[0].lemmas, a[0].targets):
        assert decode_word(target) == lex.past(lemma)
    assert a[0].targets.shape == (32, MAX_PAST_LEN)


def test_batch_iterator_errors():
    data = make_dataset(0.2, seed=0)
    with pytest.raises(ValueError, match="larger than the data"):
        iterate_batches(data.train, len(data.train) + 1, 1)
    with pytest.raises(TypeError, match="integer"):
        iterate_batches(data.train, "64", 1)


# -- symbol indices are checked on the way back (issue 7) ---------------------------------------------

@pytest.mark.parametrize("indices,error,message", [
    ([7, 15, -1], ValueError, "symbol index -1 at position 2 is outside the valid range [0, 27)"),
    ([-27], ValueError, "symbol index -27"),
    ([27], ValueError, "symbol index 27 at position 0"),
    (np.array([5, 1000]), ValueError, "symbol index 1000"),
    (np.array([7, 15, 0, -3]), ValueError, "symbol index -3"),     # even after the end of the word
    ([7.0, 15.0], TypeError, "integer symbol indices"),
    (np.array([1.5]), TypeError, "integer symbol indices"),
    ([True, False], TypeError, "integer symbol indices"),
    ("go", TypeError, "integer symbol indices"),
    ([None], TypeError, "integer symbol indices"),
    ([[7, 15]], ValueError, "1-D array"),
])
def test_decode_word_rejects_bad_indices(indices, error, message):
    with pytest.raises(error, match=re.escape(message)):
        decode_word(indices)


@pytest.mark.parametrize("indices,error,message", [
    (np.array([[1, -1]]), ValueError, "symbol index -1 at position (0, 1)"),
    (np.array([[0], [27]]), ValueError, "symbol index 27 at position (1, 0)"),
    (np.array([[0.0, 1.0]]), TypeError, "integer symbol indices"),
    (np.array([[True]]), TypeError, "integer symbol indices"),
    (np.array([1, 2]), ValueError, "2-D array"),
])
def test_one_hot_rejects_bad_indices(indices, error, message):
    with pytest.raises(error, match=re.escape(message)):
        one_hot(indices)


def test_good_indices_still_work():
    assert decode_word([]) == "" and decode_word(np.array([26], np.uint8)) == "z"
    assert decode_word(np.array([N_SYMBOLS - 1, 0, 0])) == "z"
    encoded = one_hot(np.array([[N_SYMBOLS - 1, 0]], np.uint16))
    assert encoded.shape == (1, 2 * N_SYMBOLS) and encoded[0, N_SYMBOLS - 1] == 1 and encoded[0, N_SYMBOLS] == 1
    assert one_hot(np.zeros((0, MAX_LEMMA_LEN), np.int64)).shape == (0, MAX_LEMMA_LEN * N_SYMBOLS)


def test_lab_verbs_live_with_the_data():
    assert data_module.REGULAR_VERBS | data_module.IRREGULAR_VERBS == frozenset(LAB)
    lex = load_lexicon()
    assert all(lex.is_regular(v) for v in data_module.REGULAR_VERBS)
    assert not any(lex.is_regular(v) for v in data_module.IRREGULAR_VERBS)
