"""The model fan-out's tree (roles/model_cache/filter_plugins/model_cache_tree.py)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.conftest import ROOT, load_script

TREE = load_script(ROOT / "roles/model_cache/filter_plugins/model_cache_tree.py")


@given(count=st.integers(min_value=1, max_value=400), fanout=st.integers(min_value=1, max_value=8))
def test_every_node_is_reached_and_no_node_sends_to_more_than_k(count: int, fanout: int) -> None:
    order = [f"node{i}" for i in range(count)]
    tree = TREE.model_cache_tree(order, fanout)
    assert list(tree) == order
    seed = tree[order[0]]
    assert (seed["parent"], seed["level"]) == ("", 0)
    for host, node in tree.items():
        assert len(node["children"]) <= fanout
        if host != order[0]:
            parent = tree[node["parent"]]
            assert host in parent["children"] and node["level"] == parent["level"] + 1
            # A parent comes before its child: the parent has the files when the child's round starts.
            assert order.index(node["parent"]) < order.index(host)
    # Breadth-first: the fewest rounds a tree with at most k children per node allows.
    depth, reach = 0, 1
    while reach < count:
        depth, reach = depth + 1, reach + fanout ** (depth + 1)
    assert max(n["level"] for n in tree.values()) == depth


def test_the_chain_and_the_seeds_three() -> None:
    chain = TREE.model_cache_tree(["a", "b", "c"], 1)
    assert [(h, n["parent"], n["level"]) for h, n in chain.items()] == [("a", "", 0), ("b", "a", 1), ("c", "b", 2)]
    three = TREE.model_cache_tree([f"n{i}" for i in range(13)], 3)
    assert three["n0"]["children"] == ["n1", "n2", "n3"] and three["n1"]["children"] == ["n4", "n5", "n6"]
    assert max(n["level"] for n in three.values()) == 2  # 1 + 3 + 9 = 13 nodes in two rounds


def test_a_bad_fanout_or_a_name_given_twice_is_refused() -> None:
    with pytest.raises(ValueError, match="model_cache_fanout is at least 1"):
        TREE.model_cache_tree(["a", "b"], 0)
    with pytest.raises(ValueError, match="named twice"):
        TREE.model_cache_tree(["a", "b", "a"], 2)
