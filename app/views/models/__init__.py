"""View models for the dashboard pages, shaped from the same services the REST API uses.

Each page has a module here; views call these functions and hand the result to a template.
Nothing here renders HTML, and nothing here is reachable without going through a view's auth.
"""
