"""What the plan becomes on the nodes, in import order:

* ``serve``: each node's vllm serve launches, the verify targets and their report;
* ``deployment``: what the whole deployment shares (gateway, monitoring, verify, rolling updates);
* ``rdma``: InfiniBand/RoCE for NCCL and the containers;
* ``records``: one small record per node (its launches, Ray membership, paths);
* ``rayserve``, ``dashboards``: the Ray Serve LLM config and the Grafana dashboards.
"""
