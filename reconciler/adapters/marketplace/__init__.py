"""Marketplace adapters behind one port (`base.Marketplace`).

`base` holds the Protocol and the dataclasses every caller uses; `vastai` speaks the vast.ai REST API;
`local` (the demo's declared machines) lives next to them. Callers import the adapter they need by module,
so importing this package pulls in no HTTP library.
"""

from reconciler.domain.marketplace import (
    INSTANCE_STATUSES,
    Instance,
    InstanceRequest,
    Marketplace,
    MarketplaceError,
    Offer,
    OfferQuery,
    PermanentMarketplaceError,
    TemporaryMarketplaceError,
)

__all__ = [
    "INSTANCE_STATUSES",
    "Instance",
    "InstanceRequest",
    "Marketplace",
    "MarketplaceError",
    "Offer",
    "OfferQuery",
    "PermanentMarketplaceError",
    "TemporaryMarketplaceError",
]
