"""The HTTP door: ``Idempotency-Key`` for ASGI (``idemstore.http.asgi``), WSGI
(``idemstore.http.wsgi``), Django (``idemstore.http.django``) and FastAPI
(``idemstore.http.fastapi``) apps, on one set of rules: who the caller is
(``idemstore.http.callers``), what identifies a request (``idemstore.http.request_identity``),
how a response is recorded (``idemstore.http.recording``) and how a refusal is answered
(``idemstore.problems``). A door module keeps only its framework's wire."""
