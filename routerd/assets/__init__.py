"""Model assets (cluster reference §8): weight files known by sha256, served to peers, pulled from
peers, kept under ``models.shared_dir`` and exposed only inside ``models.file_roots``."""
