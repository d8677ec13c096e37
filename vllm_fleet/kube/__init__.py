"""The plan as Kubernetes manifests, in import order:

* ``options``: what the rendering needs beyond the plan (namespace, images, volumes, Secret names);
* ``pods``: an instance's planned launches as pod templates (LeaderWorkerSet's environment);
* ``workloads``: Deployments, LeaderWorkerSets, a Service per model, the NetworkPolicy;
* ``gateway``, ``monitoring``, ``rayservice``: nginx, the Prometheus Operator's objects, KubeRay;
* ``manifests``: all of them from one plan, and the YAML stream.
"""
