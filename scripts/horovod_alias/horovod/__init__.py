"""An import alias for running Horovod's own tests and examples on hvdkeras.

Not part of hvdkeras and not installed with it: scripts/horovod_tests.py puts
this folder on PYTHONPATH. Each module re-exports hvdkeras under the module
path a Horovod script imports; the few helpers Horovod's test utilities
import from Horovod's internals are small stand-ins, named as such.
"""
