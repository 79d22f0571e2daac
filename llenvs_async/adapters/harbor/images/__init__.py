"""Task images: which local image a name means, Dockerfile rewriting, building and caching, and the
verifier's downloads provisioned at build time."""
