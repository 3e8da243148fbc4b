"""Identity and access: who is calling (tokens), what they may do (rules), and what they did (audit).

`control.AccessControl` is the head's one object for it; `rules` attaches it to the FastAPI app.
"""
