"""Labels and annotations the dispatcher puts on what it creates."""

# On every wrapped object and every pod template inside it: the AppWrapper's name.
# The namespace is the object's own (items live in their AppWrapper's namespace).
APPWRAPPER_LABEL = "workload.codeflare.dev/appwrapper"
