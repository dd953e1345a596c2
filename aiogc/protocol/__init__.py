"""The wire contract: messages, codecs, authentication, status codes."""
