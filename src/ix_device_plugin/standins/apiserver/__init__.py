"""A stand-in for the Kubernetes API server: real HTTP on 127.0.0.1, the real REST paths, an in-memory store.

It answers the paths and semantics the plugin's features use, as kube-apiserver does:
- core v1 `configmaps`, `pods` (namespaced, and `/api/v1/pods` across namespaces) and `nodes`;
- `resource.k8s.io` `resourceslices` (cluster-scoped) and `resourceclaims` (namespaced) under `v1`,
  `v1beta1` and `v1beta2`, all versions sharing one store;
- GET (one object or a list, with `fieldSelector` and `labelSelector`), POST (201, or 409 AlreadyExists),
  PUT (409 Conflict when `metadata.resourceVersion` is stale), PATCH (merge patch and strategic merge
  patch; lists are replaced whole, which is what strategic merge does for the fields used here), DELETE;
  `dryRun=All` on POST and PUT (the object as it would be stored, nothing stored);
- 422 Invalid with `details.causes` naming the fields, as kube-apiserver's validation answers (an object's name
  that is not a DNS subdomain of at most 253 characters, on create and replace);
- the garbage collector, modelled simply (store.py): an object whose owners are all gone (no object of the
  owner reference's kind, name and UID) is deleted shortly after the change that made it so;
- `?watch=true` on a collection (or on `/api/v1/nodes/{name}`): chunked JSON lines
  `{"type": "ADDED|MODIFIED|DELETED|BOOKMARK|ERROR", "object": ...}` resuming after `resourceVersion`, an
  ERROR event with a 410 Expired status when that version is older than the history kept, `timeoutSeconds`;
- errors as `kind: Status` objects with `reason` and `code`; one global resourceVersion counter;
- `metadata.managedFields` for every create, replace and patch, as kube-apiserver records writes that are not
  server-side apply (managedfields.py): the writer is the `fieldManager` parameter, else the user agent's program
  name; `patch()` writes as a named manager through the same path (a test playing another client);
- a bearer token (401 without it).

Switches for tests: `unavailable` (every request answered 503), `delay` (seconds before every answer),
`refuse()`/`accept()` (the port stops and starts listening; open connections are cut), `drop_watches()`,
`compact()` (forget the history so old versions get 410), `watches_end` ("expired": every watch is answered
410 Expired at once, as after a compaction; "at once": every watch ends at once, cleanly, with no event),
`bodies` (a hostile server's answers, bodies.KINDS: every GET answered with a body that never ends, or that
declares 300 MB and sends nothing, or that is gzip nobody asked for; every watch with an event that never ends),
`device_taints`, `shared_counters`, `consumable_capacity` (False: those ResourceSlice fields dropped on write, as
with their feature gates off), `counters_refused` (ResourceSlice writes holding shared counters answered 422
naming those fields), `refuse_writes()` (the next writes of a kind answered 422 naming a field, as an admission
webhook refusing for a while), `slow_down()` (the next matching request handled late), `garbage_collector`.
`requests` records every request; `watching(plural)` returns once a watch of that kind is open (a change
made then reaches it), `open_watches(plural)` counts them.
`write_kubeconfig()` writes a kubeconfig pointing at it.
"""

from ix_device_plugin.standins.apiserver.protocol import (
    KINDS,
    TOKEN,
    Kind,
    Recorded,
    StatusError,
    field_matcher,
    label_matcher,
    merge_patch,
    status_object,
)
from ix_device_plugin.standins.apiserver.server import ApiServerStandIn

__all__ = [
    "KINDS",
    "TOKEN",
    "ApiServerStandIn",
    "Kind",
    "Recorded",
    "StatusError",
    "field_matcher",
    "label_matcher",
    "merge_patch",
    "status_object",
]
