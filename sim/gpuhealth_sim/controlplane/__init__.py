"""The local control plane: etcd, kube-apiserver, controller manager, scheduler and kwok on loopback ports.

How the components are found (`binaries`), started with which flags
(`components`, `kwok-stages.yaml`), trusted (`pki`, `kubeconfigs`), run as
child processes (`processes`, `ports`) and probed (`probes`); `local` holds
the `ControlPlane` that ties them together for tests, benchmarks and the
demo. Plain Kubernetes: nothing here knows about GPUs, the fleet, the demo
or backtests.
"""
