"""criticalsvc: a Kubernetes deletion gate for critical services.

A CriticalService names a provider workload (a finalizer controller, a webhook server, ...) and the
criteria under which it may go away. The admission webhook denies the DELETE of the provider, of its
namespace and of the CriticalService itself until those criteria hold, so an all-at-once teardown
comes apart in a safe order without any client coordinating it.
"""

__version__ = "0.1.0"
