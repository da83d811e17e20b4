"""Who may do what: the creator recorded on an AppWrapper and its rights asked as
that user (SubjectAccessReview), grants for priorities and quota, which wrappers
a cycle may consider, and bearer tokens checked by TokenReview.
"""
