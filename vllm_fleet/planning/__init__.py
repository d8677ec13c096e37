"""The planner's layout decisions, in import order:

* ``cluster``: the nodes (GPUs, links, NICs) from an inventory or a cluster file;
* ``wishes``: what the operator asks for (the declared options and the deployment's hand-offs);
* ``checks``: the wishes' refusals, vLLM's own per node, and the TP sizes a model shards into;
* ``executor``: how a chosen instance runs (one node, DP, native multi-node or Ray);
* ``render``: an instance's vllm serve arguments; ``table``: the plan as a person reads it;
* ``strategy``: the search (replicas, TP, PP, layer partitions, DP+EP) and the plan;
* ``allocate``: several models on one cluster, as one plan.
"""
