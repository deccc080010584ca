"""Names vulture cannot see being used (pyproject.toml [tool.vulture]): fields of the data
model read through dataclasses.asdict or pydantic, attributes the libraries read. Made with
``vulture --make-whitelist``; a new line here is a claim that the name is used, not dead."""

# ruff: noqa
# mypy: ignore-errors

ends_at  # unused variable (nodeguard/alerts/webhook.py:141)
_.retries  # unused attribute (nodeguard/kube/client.py:105)
_.ssl_ca_cert  # unused attribute (nodeguard/kube/client.py:167)
_.api_key  # unused attribute (nodeguard/kube/client.py:168)
_.api_key_prefix  # unused attribute (nodeguard/kube/client.py:169)
_.exc_text  # unused attribute (nodeguard/logs.py:92)
_.caption  # unused attribute (nodeguard/report.py:177)
description  # unused variable (nodeguard/rules/schema.py:204)
description  # unused variable (nodeguard/rules/schema.py:235)
description  # unused variable (nodeguard/rules/schema.py:253)
cached_bytes  # unused variable (nodeguard/snapshot.py:94)
swap_total_bytes  # unused variable (nodeguard/snapshot.py:99)
swap_free_bytes  # unused variable (nodeguard/snapshot.py:100)
inactive_file_bytes  # unused variable (nodeguard/snapshot.py:152)
info_version  # unused variable (nodeguard/snapshot.py:271)
mig_compute_instance_id  # unused variable (nodeguard/snapshot.py:291)
kubernetes  # unused variable (tests/cluster/test_controlplane_smoke.py:14)
_.ssl_ca_cert  # unused attribute (tests/cluster/test_controlplane_smoke.py:106)
_.api_key  # unused attribute (tests/cluster/test_controlplane_smoke.py:107)
_.api_key_prefix  # unused attribute (tests/cluster/test_controlplane_smoke.py:108)
buffers_bytes  # unused variable (nodeguard/snapshot.py:151)
shmem_bytes  # unused variable (nodeguard/snapshot.py:154)
# http.server.BaseHTTPRequestHandler calls these (tests/support/doctor_cluster.py stand-in kubelet)
_.do_GET
_.log_message
# nodeguard trials --json writes every TrialRow field (dataclasses.asdict)
_.peak_anon_bytes
