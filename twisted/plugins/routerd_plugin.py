"""twistd plugin: ``twistd routerd`` runs one routerd node."""

from twisted.application.service import ServiceMaker

routerd = ServiceMaker(
    "routerd",
    "routerd.tap",
    "Cluster router for local AI inference backends",
    "routerd",
)
