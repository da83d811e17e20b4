"""The admission webhooks: the creator recorded, each AppWrapper reviewed and each
item authorised as its creator, the pod webhook, and their certificates.
"""
