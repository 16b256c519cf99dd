"""Everything that touches an engine: config schema and launcher, local model builder, streaming
OpenAI client, and the /metrics reader. Imports only `scheduler` among nightshift packages."""
