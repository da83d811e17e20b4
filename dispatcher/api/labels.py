"""Labels and annotations the dispatcher puts on what it creates."""

# On every wrapped object and every pod template inside it: the AppWrapper's name.
# The namespace is the object's own (items live in their AppWrapper's namespace).
APPWRAPPER_LABEL = "workload.codeflare.dev/appwrapper"

# MCAD's labels, beside ours, so tools and tests written against MCAD (its kuttl suites
# select the Deployment it created by them) find the same objects: the AppWrapper's name,
# and the item's own name. Only ours identifies a gang's pods to the dispatcher.
MCAD_APPWRAPPER_LABEL = "appwrapper.mcad.ibm.com"
MCAD_RESOURCE_NAME_LABEL = "resourceName"
