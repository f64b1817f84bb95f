"""``with obj:`` for the library's objects that hold files, locks or threads: one definition of
"close at the end of the block, whatever happened in it" instead of a pair of dunders in each."""

from __future__ import annotations

from typing import Self


class ClosesOnExit:
    """Mixin: ``__enter__`` returns the object, ``__exit__`` calls its ``close()``; exceptions
    from the block propagate (nothing is swallowed)."""

    def close(self) -> None:
        # Every user defines its own close(); this one only tells the type checker it exists.
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
