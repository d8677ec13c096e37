"""The node agents: the small processes vllm-fleet runs on every node beside vLLM.

Stdlib only, Python 3.10+: the roles copy this folder to each node (and into the serving
containers of a multi-node group, through the state folder) and run an agent with the
node's own python3, never with the controller's environment:

    python3 DIR/vllm_fleet_agents AGENT [ARGS...]

supervise      restart-on-failure and log rotation for hosts without systemd
group          one rank of a multi-node instance: the group lives and dies as one
reap           the main process of a vLLM unit: reaps what vLLM leaves behind
watchdog       restarts a launch that is hung (no /health) or stuck (no token while busy)
health         one check for the role's start-up wait (healthy, crashed)
gateway_watch  the gateway's active health checks, drains and vllm-router workers

Shared helpers (/proc, signals, HTTP, unit and container state, atomic writes) are in
``common``; nothing here imports the planner.
"""

AGENTS = ("supervise", "group", "reap", "watchdog", "health", "gateway_watch")
