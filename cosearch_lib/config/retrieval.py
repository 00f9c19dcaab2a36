"""The search budget every stage shares, the dense retriever and the HTTP retrieval server."""

from __future__ import annotations

from dataclasses import dataclass, field

from cosearch_lib.config.checks import LOCATION_ONLY, SPEED_ONLY, ConfigError, Fields, invalid


@dataclass
class SearchBudget:
    """N, K and the search cap: the one home of the three numbers every stage agrees on.

    The profile holds one instance; :class:`~cosearch_lib.config.ProtocolConfig` (the prompts state
    K and the cap), :class:`~cosearch_lib.config.RolloutConfig` (the engine retrieves N, shows K,
    stops at the cap) and the evaluation harness are built with a reference to that same object, so
    they cannot disagree.
    """

    topn: int = 50  # N: candidates the retriever returns per sub-query (paper: 50)
    topk: int = 5  # K: passages the ranker keeps and the agent reads per search (paper: 5)
    max_searches: int = 6  # search calls allowed per trajectory (paper: 6); the turn after the last must answer

    def __post_init__(self) -> None:
        Fields("search", self).ints("topn", "topk", "max_searches", minimum=1)
        if self.topk > self.topn:
            raise ConfigError(f"need search.topk <= search.topn, got topk={self.topk}, topn={self.topn}")


@dataclass
class EncoderConfig:
    model: str = "all-minilm-l6-v2"  # bundled name, local folder or hub id (e.g. intfloat/e5-base-v2)
    pooling: str = "mean"  # "mean" over unmasked tokens, or "cls" (first token)
    max_length: int = 256  # tokens per text; longer texts are truncated (Search-R1 uses 256 for e5)
    batch_size: int = 64  # texts per forward pass
    fp16: bool = True  # half precision on CUDA (ignored on CPU)
    e5_prefixes: bool | None = None  # add "query: "/"passage: "; None = on when the model name contains "e5"

    def __post_init__(self) -> None:
        check = Fields("retrieval.encoder", self)
        check.choice("pooling", ("mean", "cls"))
        check.ints("max_length", "batch_size", minimum=1)

    @property
    def use_e5_prefixes(self) -> bool:
        if self.e5_prefixes is not None:
            return self.e5_prefixes
        return "e5" in self.model.lower().replace("\\", "/").split("/")[-1]


@dataclass
class RetrievalConfig:
    encoder: EncoderConfig = field(default_factory=EncoderConfig)  # the dense encoder
    index_kind: str = "flat"  # "flat" (exact inner product) or "hnsw" (approximate)
    hnsw_m: int = 32  # HNSW graph degree (hnsw only)
    ef_search: int = 128  # HNSW search breadth (hnsw only)
    mmap_index: bool = False  # memory-map the index instead of reading it into RAM (for indexes larger than RAM)
    index_shard_rows: int = field(default=1 << 16, metadata=SPEED_ONLY)  # passages per shard when the index is encoded (build-index: the ranks share shards; a cut build resumes)
    index_device: str = field(default="cpu", metadata=SPEED_ONLY)  # "cpu", or "gpu": the flat index on every visible GPU, replicated when it fits one, else sharded over them (faiss-gpu, the gpu extra)
    server_url: str | None = field(default=None, metadata=LOCATION_ONLY)  # search through this retrieval server (cosearch serve-retriever) instead of loading the index in each process; $COSEARCH_RETRIEVER_URL sets it for a job

    def __post_init__(self) -> None:
        Fields("retrieval", self).choice("index_kind", ("flat", "hnsw"))
        Fields("retrieval", self).choice("index_device", ("cpu", "gpu"))
        Fields("retrieval", self).ints("index_shard_rows", minimum=1)
        if self.index_device == "gpu" and self.index_kind != "flat":
            raise ConfigError("retrieval.index_device: gpu moves a flat index (FAISS has no GPU HNSW); "
                              "set retrieval.index_kind: flat or index_device: cpu")
        if self.server_url is not None and (not isinstance(self.server_url, str)
                                            or not self.server_url.startswith(("http://", "https://"))):
            raise ConfigError(f"retrieval.server_url: expected an http(s) URL such as http://127.0.0.1:8000, "
                              f"got {self.server_url!r}")


@dataclass
class ServerConfig:
    """Where the server listens and the limits it enforces on every request."""

    host: str = "127.0.0.1"  # interface to bind; loopback unless you mean to expose the index
    port: int = 8000  # TCP port; 0 picks a free port (serve_in_background reports the real one)
    default_topk: int = 3  # topk used when a request omits it (Search-R1's default is 3)
    max_topk: int = 100  # largest topk accepted; also capped by the corpus size when known
    max_queries_per_request: int = 256  # most queries one POST may carry
    max_query_chars: int = 2_000  # longest query string accepted (characters)
    max_batch_queries: int = 64  # most queries the batcher sends to the backend in one call
    batch_wait_ms: float = 2.0  # how long the batcher waits for more requests to fill a batch
    max_body_bytes: int = 1_000_000  # largest request body accepted (bytes)
    max_pending_queries: int = 8_192  # queued queries beyond which new requests get 503
    request_timeout_s: float = 120.0  # a request waiting longer than this gets 504
    body_timeout_s: float = 10.0  # a client that takes longer than this to send its body gets 408 (a stalled sender)
    retry_after_s: int = 1  # Retry-After of a 503 (queue full): when an overloaded client should try again
    log_level: str = "warning"  # uvicorn log level

    def __post_init__(self) -> None:
        check = Fields("server", self)
        check.ints("default_topk", "max_topk", "max_queries_per_request", "max_query_chars", "max_batch_queries",
                   "max_body_bytes", "max_pending_queries", minimum=1)
        check.ints("port", minimum=0, maximum=65535, why="0 picks a free port")
        if self.default_topk > self.max_topk:
            raise invalid("server.default_topk", self.default_topk, f"<= server.max_topk ({self.max_topk})")
        check.ints("retry_after_s", minimum=0)
        check.numbers("batch_wait_ms", low=0, finite=False)
        check.numbers("request_timeout_s", "body_timeout_s", low=0, low_open=True, finite=False)
