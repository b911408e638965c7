"""faultlens node side: signal sources, table schemas, the store layout and the segment sink."""
