"""Labels and annotations the dispatcher puts on what it creates, and those its users put
on AppWrappers for it."""

# On every wrapped object and every pod template inside it: the AppWrapper's name.
# The namespace is the object's own (items live in their AppWrapper's namespace).
APPWRAPPER_LABEL = "workload.codeflare.dev/appwrapper"

# MCAD's labels, beside ours, so tools and tests written against MCAD (its kuttl suites
# select the Deployment it created by them) find the same objects: the AppWrapper's name,
# and the item's own name. Only ours identifies a gang's pods to the dispatcher.
MCAD_APPWRAPPER_LABEL = "appwrapper.mcad.ibm.com"
MCAD_RESOURCE_NAME_LABEL = "resourceName"

# Set by users (`kubectl appwrapper hold|cancel`, or kubectl annotate), to the name of
# who asks. Held: the AppWrapper keeps its place in the queue but is not dispatched until
# the annotation goes. Cancelled: it stops for good, Failed with reason Cancelled, and
# what it created is deleted.
HELD_BY_ANNOTATION = "workload.codeflare.dev/held-by"
CANCELLED_BY_ANNOTATION = "workload.codeflare.dev/cancelled-by"

# In a manager of several clusters (`dispatcher run --manager`). On the manager's
# AppWrapper: the worker cluster it was sent to, written before the copy is made (a
# restarted manager finds it and adopts the copy, never makes a second). On the copy in
# the worker: the uid of the manager's AppWrapper it stands for.
CLUSTER_LABEL = "workload.codeflare.dev/cluster"
MANAGER_UID_LABEL = "workload.codeflare.dev/manager-uid"
