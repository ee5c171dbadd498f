"""IPython.display's objects, each showing itself by its _repr_*_ method, and display(), which
hands them to the running cell's display (kernel.py sets it: they become the cell's results)."""
import base64
import json as _json
import sys


def display(*objs, raw=False, **kwargs):
    # kernel.py runs as __main__ and keeps the running cell's display there.
    shown = getattr(sys.modules.get("__main__"), "current_display", None)
    if shown:
        shown[0](*objs, raw=raw, **kwargs)


class DisplayObject:
    binary = False

    def __init__(self, data=None, url=None, filename=None, metadata=None, **_):
        if data is None and filename is not None:
            with open(filename, "rb" if self.binary else "r") as f:
                data = f.read()
        self.data, self.url, self.metadata = data, url, metadata

    def __repr__(self):
        return f"<IPython.core.display.{type(self).__name__} object>"


class HTML(DisplayObject):
    def _repr_html_(self):
        return self.data


class Markdown(DisplayObject):
    def _repr_markdown_(self):
        return self.data


class Latex(DisplayObject):
    def _repr_latex_(self):
        return self.data


class Math(DisplayObject):
    def _repr_latex_(self):
        text = (self.data or "").strip("$")
        return f"$\\displaystyle {text}$"


class SVG(DisplayObject):
    def _repr_svg_(self):
        return self.data.decode() if isinstance(self.data, bytes) else self.data


class Javascript(DisplayObject):
    def _repr_javascript_(self):
        return self.data


class JSON(DisplayObject):
    def _repr_json_(self):
        return _json.loads(self.data) if isinstance(self.data, str) else self.data


class Image(DisplayObject):
    binary = True

    def __init__(self, data=None, url=None, filename=None, format=None, **kwargs):
        super().__init__(data, url, filename, **kwargs)
        name = (filename or url or "").lower()
        self.format = (format or ("jpeg" if name.endswith((".jpg", ".jpeg")) else "png")).lower()

    def _data(self):
        return base64.b64decode(self.data) if isinstance(self.data, str) else self.data

    def _repr_png_(self):
        return self._data() if self.format == "png" else None

    def _repr_jpeg_(self):
        return self._data() if self.format in ("jpeg", "jpg") else None
