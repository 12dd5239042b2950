"""Label selectors behave as apimachinery's LabelSelectorAsSelector does."""

from __future__ import annotations

import pytest

from criticalsvc.errors import InvalidSpec
from criticalsvc.labels import LabelSelector, Requirement, parse_label_selector


def sel(raw):
    return parse_label_selector(raw, "spec.criteria[0].resources.selector")


@pytest.mark.parametrize(
    ("expression", "labels", "matches"),
    [
        ({"key": "app", "operator": "In", "values": ["web", "db"]}, {"app": "db"}, True),
        ({"key": "app", "operator": "In", "values": ["web"]}, {"app": "db"}, False),
        ({"key": "app", "operator": "In", "values": ["web"]}, {}, False),
        ({"key": "app", "operator": "NotIn", "values": ["web"]}, {"app": "db"}, True),
        ({"key": "app", "operator": "NotIn", "values": ["web"]}, {"app": "web"}, False),
        ({"key": "app", "operator": "NotIn", "values": ["web"]}, {}, True),
        ({"key": "app", "operator": "Exists"}, {"app": ""}, True),
        ({"key": "app", "operator": "Exists"}, {"other": "x"}, False),
        ({"key": "app", "operator": "DoesNotExist"}, {}, True),
        ({"key": "app", "operator": "DoesNotExist"}, {"app": "web"}, False),
    ],
)
def test_each_operator_matches_like_kubernetes(expression, labels, matches):
    """In/NotIn/Exists/DoesNotExist match as in Kubernetes; NotIn and DoesNotExist match a missing key."""
    assert sel({"matchExpressions": [expression]}).matches(labels) is matches


def test_requirements_are_anded():
    """matchLabels and every matchExpression must all hold for a match."""
    s = sel({"matchLabels": {"app": "web"}, "matchExpressions": [{"key": "tier", "operator": "NotIn",
                                                                  "values": ["back"]}]})
    assert s.matches({"app": "web", "tier": "front"})
    assert s.matches({"app": "web"})
    assert not s.matches({"app": "web", "tier": "back"})
    assert not s.matches({"tier": "front"})


@pytest.mark.parametrize("raw", [None, {}, {"matchLabels": {}, "matchExpressions": []}])
def test_empty_selector_matches_everything(raw):
    """An absent or empty selector selects every object, labelled or not."""
    s = sel(raw)
    assert s.is_empty and s.matches({}) and s.matches({"a": "b"})


def test_selector_prints_in_kubectl_syntax():
    """A selector prints as `kubectl -l` would accept it."""
    s = sel({"matchLabels": {"app": "web"}, "matchExpressions": [
        {"key": "tier", "operator": "In", "values": ["b", "a"]},
        {"key": "x", "operator": "Exists"},
        {"key": "y", "operator": "DoesNotExist"},
        {"key": "z", "operator": "NotIn", "values": ["q"]}]})
    assert str(s) == "app=web,tier in (a,b),x,!y,z notin (q)"
    assert str(LabelSelector((Requirement("k", "In", frozenset({"v"})),))) == "k=v"


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("app=web", "selector: must be an object with matchLabels and/or matchExpressions"),
        ({"matchLabels": ["app"]}, "selector.matchLabels: must be a map of strings"),
        ({"matchExpressions": [{"key": "a", "operator": "Gt", "values": ["1"]}]},
         "selector.matchExpressions[0].operator: must be one of In, NotIn, Exists, DoesNotExist"),
        ({"matchExpressions": [{"key": "a", "operator": "NotIn"}]},
         "selector.matchExpressions[0].values: must be a non-empty list of strings for NotIn"),
        ({"matchExpressions": [{"key": "a", "operator": "In", "values": [1]}]},
         "selector.matchExpressions[0].values: must be a non-empty list of strings for In"),
        ({"matchExpressions": [{"key": "a", "operator": "Exists"},
                               {"key": "b", "operator": "DoesNotExist", "values": ["x"]}]},
         "selector.matchExpressions[1].values: must be empty for DoesNotExist"),
        ({"matchExpressions": ["a"]}, "selector.matchExpressions[0]: must be an object"),
    ],
)
def test_bad_selectors_name_the_field(raw, expected):
    """Each malformed selector is an InvalidSpec naming the exact field under the given path."""
    with pytest.raises(InvalidSpec) as info:
        sel(raw)
    assert str(info.value) == "spec.criteria[0].resources." + expected
