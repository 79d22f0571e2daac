"""The async-context-manager behaviour every resource owner shares."""

from __future__ import annotations

from types import TracebackType
from typing import Self

from .errors import ClosedError

__all__ = ["AsyncResource"]


class AsyncResource:
    """Mixin: ``async with`` refuses a closed resource and always ``aclose()``s on exit.

    Subclasses implement ``aclose`` (idempotent) and the ``closed`` property.
    """

    __slots__ = ()

    @property
    def closed(self) -> bool:
        raise NotImplementedError

    async def aclose(self) -> None:
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        if self.closed:
            raise ClosedError(type(self).__name__)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()
