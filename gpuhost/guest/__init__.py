"""`gpuhost guest`: the lifecycle of an inventory VM on its host through libvirt.

Library only (the CLI in gpuhost/cli/guest.py prints): lifecycle steps in `lifecycle`, libvirt in
`libvirt_host`, the cloud-init seed in `seed`, the guest's wheels in `wheels`, what runs inside
the guest in `provision`, controller-side state in `state`.
"""

from __future__ import annotations

from gpuhost.guest.errors import GuestStepError

__all__ = ["GuestStepError"]
