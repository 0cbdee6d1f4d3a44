"""The Ansible rollout engine of `gpuhost apply` and `gpuhost rollback`, as a library.

engine.py runs a playbook through ansible-runner and turns its events into typed per-host
outcomes and progress; report.py holds those types and apply's report (gpuhost.apply/1);
hostkeys.py says ssh's host-key warning in one sentence; environment.py is what the
ansible-playbook runs see (environment, playbooks, per-host known_hosts). Nothing here prints.
"""
