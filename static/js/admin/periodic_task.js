// The admin's form for a periodic task (templates/admin/djcelery/change_periodictask_form.html):
// what django-celery-beat's inline script does, from a file, as the Content-Security-Policy
// wants. The crontab's help says in words when the chosen schedule runs, and the read-only
// translation field it replaces is hidden.
"use strict";

(($) => {
  const readable = JSON.parse(document.getElementById("readable-crontabs").textContent);
  const help = document.querySelector(".field-crontab .help");
  const original = help ? help.textContent.trim() : "";

  $(".field-crontab_translation").hide();
  $(".field-crontab").on("change", () => {
    if (!help) return;
    const words = readable[$("#id_crontab").val()];
    if (words === undefined) {
      help.replaceChildren(original);
    } else {
      help.replaceChildren(original, document.createElement("br"), `Translation: ${words}`);
    }
  });
})(django.jQuery);
