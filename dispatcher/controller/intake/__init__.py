"""Watch events and listings of nodes, QuotaSubtrees and AppWrappers into memory,
with no API call and no waiting; what is followed of each wrapper.
"""
