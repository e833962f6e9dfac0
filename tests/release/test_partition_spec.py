"""The partition syntax: parsing, resolution against the data, and errors that name variable and value."""

from __future__ import annotations

import re

import numpy as np
import pytest

from veil.release import KEEP, Partition, PartitionError

AGES = np.array([str(a) for a in range(0, 91)])
RACES = np.array(["Asian", "Black", "Other", "White"])


def groups_of(partition, var, cats):
    group_of, labels = partition.resolve(var, cats)
    return {c: labels[g] for c, g in zip(cats.tolist(), group_of.tolist())}


def test_ranges_lists_rest_and_keep():
    p = Partition.parse("sex; age=0-17,18-64,65- ;race=White,Black,*;marital=never married,married|widowed")
    assert p.spec["sex"] is KEEP
    ages = groups_of(p, "age", AGES)
    assert ages["0"] == ages["17"] == "0-17" and ages["18"] == "18-64" and ages["65"] == ages["90"] == "65-"
    races = groups_of(p, "race", RACES)
    assert races == {"Asian": "*", "Black": "Black", "Other": "*", "White": "White"}
    marital = groups_of(p, "marital", np.array(["married", "never married", "widowed"]))
    assert marital["married"] == marital["widowed"] == "married|widowed"
    keep, labels = p.resolve("sex", np.array(["F", "M"]))
    assert keep.tolist() == [0, 1] and labels == ["F", "M"]
    free, labels = p.resolve("area", np.array(["1", "2", "3"]))  # not named: one group, may change freely
    assert free.tolist() == [0, 0, 0]
    assert p.text() == "sex;age=0-17,18-64,65-;race=White,Black,*;marital=never married,married|widowed"
    assert Partition.parse(p.text()) == p


def test_a_value_that_looks_like_a_range_is_the_value():
    cats = np.array(["0-17", "18-64", "65+"])
    p = Partition.parse("agegroup=0-17|18-64,65+")
    assert groups_of(p, "agegroup", cats) == {"0-17": "0-17|18-64", "18-64": "0-17|18-64", "65+": "65+"}


def test_mapping_form_takes_any_value():
    p = Partition({"sex": None, "note": [["a,b", "c;d"], ["*"]], "age": ["0-17", "18-"]})
    assert groups_of(p, "note", np.array(["a,b", "c;d", "e"])) == {"a,b": "a,b|c;d", "c;d": "a,b|c;d", "e": "*"}
    assert p.spec["age"] == (("0-17",), ("18-",))
    assert Partition.of(None).spec == {} and Partition.of(p) is p


@pytest.mark.parametrize(
    "spec, var, cats, message",
    [
        ("age=0-17,10-64,65-", "age", AGES, "value '10' of column 'age' falls in two groups ('0-17' and '10-64')"),
        ("age=0-17,18-64", "age", AGES, "value '65' of column 'age' is in no group"),
        ("race=White,Black,Purple", "race", RACES, "'Purple' is not a value of column 'race'"),
        ("age=20-10,*", "age", AGES, "range '20-10' of variable 'age' ends before it starts"),
        ("race=White,*,Black|*", "race", RACES, "variable 'race' uses '*' twice"),
    ],
)
def test_resolution_errors_name_the_variable_and_the_value(spec, var, cats, message):
    with pytest.raises(PartitionError, match=re.escape(message)):
        Partition.parse(spec).resolve(var, cats)


@pytest.mark.parametrize(
    "spec, message",
    [
        ("age=0-17;age=18-", "variable 'age' is named twice"),
        ("=a,b", "names no variable"),
        ("race=White,,Black", "variable 'race' has an empty group"),
        ("race=White|", "variable 'race' has an empty group"),
    ],
)
def test_parse_errors(spec, message):
    with pytest.raises(PartitionError, match=message):
        Partition.parse(spec)
