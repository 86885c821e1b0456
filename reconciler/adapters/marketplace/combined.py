"""A rental market and the owned hosts behind one `Marketplace`: pools on owned hosts beside rented ones.

Place in the flow: `build_marketplace` wraps the two when the settings name an inventory (`hosts_file`) beside a
rental backend. A search goes to the owned hosts when the pool runs on them (`OfferQuery.owned_hosts`, the pool's
placement), to the market otherwise; a create, read or destroy goes to whichever adapter the id belongs to (owned
ids are `<host>.<...>` with an inventory host; vast's are numbers, the local market's `offer-`/`local-`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from reconciler.adapters.marketplace.hosts import HostsMarketplace
from reconciler.domain.marketplace import Instance, InstanceRequest, Marketplace, Offer, OfferQuery


class CombinedMarketplace:
    def __init__(self, rented: Marketplace, owned: HostsMarketplace):
        self.rented = rented
        self.owned = owned

    def __repr__(self) -> str:
        return f"CombinedMarketplace({self.rented!r}, {self.owned!r})"

    @property
    def notify(self) -> Callable[[str], None] | None:
        return self.owned.notify

    @notify.setter
    def notify(self, say: Callable[[str], None] | None) -> None:
        self.owned.notify = say
        if hasattr(self.rented, "notify"):
            self.rented.notify = say

    def _for(self, ident: str) -> Marketplace:
        return self.owned if self.owned.claims(ident) else self.rented

    def search_offers(self, query: OfferQuery) -> Sequence[Offer]:
        return (self.owned if query.owned_hosts else self.rented).search_offers(query)

    def create_instance(self, offer_id: str, request: InstanceRequest) -> str:
        return self._for(offer_id).create_instance(offer_id, request)

    def list_instances(self) -> Sequence[Instance]:
        return [*self.rented.list_instances(), *self.owned.list_instances()]

    def get_instance(self, contract_id: str) -> Instance | None:
        return self._for(contract_id).get_instance(contract_id)

    def destroy_instance(self, contract_id: str) -> None:
        self._for(contract_id).destroy_instance(contract_id)
