"""The neutral layer of inventory types: what the operator asks for (VMs, audit policy, plan settings).

Everything above (checks, plan, render, guest, the CLI) reads these types; nothing here imports them.
"""
