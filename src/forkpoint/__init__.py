"""forkpoint: microVM sessions you can checkpoint, fork and roll back.

Kept import-free on purpose: the guest agent ships ``forkpoint.protocol`` and
``forkpoint.guest`` into the VM, where nothing else of the package exists.
"""

__version__ = "0.1.0"
