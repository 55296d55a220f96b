"""The gRPC edge: the servicer (parse at the wire, raise the domain's refusals), the refusal
interceptor (:mod:`.refusals`: refusal -> gRPC status, once), the token interceptor
(:mod:`.auth`) and the connection guard (:mod:`.guard`).
"""
