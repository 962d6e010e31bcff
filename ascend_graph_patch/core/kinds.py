"""The names the graph model is keyed by: attention kinds and graph roles."""

FIA = "fia"
FIA_V2 = "fia_v2"
PA = "pa"
MLA = "mla"

TARGET = "target"
DRAFT = "draft"
DRAFT_PREFILL = "draft_prefill"
