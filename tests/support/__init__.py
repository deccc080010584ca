"""What the tests share: a running agent and the one wait helper (``agent``), real cgroups
(``kernel_cgroup``), the test control plane (``controlplane``, ``kube_helpers``, ``katib``,
``apiproxy``), the manifests (``deploy``), the NVML stub (``gpu``), the fixture hosts
(``hosts``) and the stand-ins. Test modules import from here, never from one another."""
