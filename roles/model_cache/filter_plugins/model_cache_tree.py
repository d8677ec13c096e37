"""model_cache_tree: the fan-out tree the model's files travel along, node to node.

    {{ ['node1', 'node4', 'node7', 'node9'] | model_cache_tree(2) }}
    -> {'node1': {'parent': '', 'level': 0, 'children': ['node4', 'node7']},
        'node4': {'parent': 'node1', 'level': 1, 'children': ['node9']}, ...}

The first name is the seed (the node that already has the files); the others are the nodes that
lack them, in the order given. A k-ary tree in breadth-first order: no node sends to more than
``fanout`` others at once, and the files reach N nodes in about log_k(N) rounds of one copy each.
"""

from __future__ import annotations

from typing import Any


def model_cache_tree(order: list[str], fanout: int) -> dict[str, dict[str, Any]]:
    fanout = int(fanout)
    if fanout < 1:
        raise ValueError(f"model_cache_fanout is at least 1 (now {fanout})")
    if len(set(order)) != len(order):
        raise ValueError(f"a node is named twice in {order}")
    tree: dict[str, dict[str, Any]] = {}
    for index, host in enumerate(order):
        parent = order[(index - 1) // fanout] if index else ""
        tree[host] = {"parent": parent, "level": tree[parent]["level"] + 1 if parent else 0, "children": []}
        if parent:
            tree[parent]["children"].append(host)
    return tree


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"model_cache_tree": model_cache_tree}
