"""Security: TLS and mutual TLS (`tls`), bearer tokens mapped to tenants (`tokens`),
the authentication interceptor (`auth`), and development certificates (`certs`).
See docs/security.md."""
