"""Model assets (cluster reference §8): weight files known by sha256, served to peers, pulled from
peers, kept under ``models.shared_dir`` and exposed only inside ``models.file_roots``; the node's
asset service binding its portable configs (``service``), and Cook, which builds a model config
from the files a node's file roots expose (``cook``)."""
