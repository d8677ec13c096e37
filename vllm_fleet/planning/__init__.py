"""The planner's layout decisions around strategy.py's search, in import order:

* ``wishes``: what the operator asks for (the declared options and the deployment's hand-offs);
* ``checks``: the wishes' refusals, vLLM's own per node, and the TP sizes a model shards into;
* ``executor``: how a chosen instance runs (one node, DP, native multi-node or Ray).
"""
