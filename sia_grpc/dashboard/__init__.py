"""`sia dashboard`: a read-only web view of a live cluster (docs/dashboard.md).

A separate process that is only a client of the controller's gRPC API: it sees what
its token may see (a tenant's token: that tenant's jobs; an admin's: all), keeps one
upstream watch (`feed.Feed`) and pushes each change to every open page as a
server-sent event (`server.Dashboard`). The pages are drawn on the server
(`render`, `job_page`, with inline SVG charts from `charts`); no file is fetched from
outside at run time.
"""

from sia_grpc.dashboard.server import Dashboard

__all__ = ["Dashboard"]
