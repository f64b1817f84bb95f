"""Who is signed in: server-side dashboard sessions (``sessions``)."""
