"""The inventory side: ``interface`` (every vllm_fleet_* variable, resolved and checked), ``facts``
(gpu_facts' raw outputs parsed), ``hostvars`` (what the Ansible filters read of the inventory)."""
